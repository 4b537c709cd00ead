"""Small things every layer uses: atomic files, subprocesses, progress, interrupts, the project's places, YAML user files."""
