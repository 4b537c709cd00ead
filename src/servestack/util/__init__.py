"""Small things every layer uses: the console, atomic files, subprocesses, progress, interrupts, the project's places, YAML user files."""
