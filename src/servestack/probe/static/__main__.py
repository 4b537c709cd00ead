"""`python path/to/static CONFIG.json`: how servestack runs the probe inside an image (see the package doc)."""

import os
import sys

if not __package__:
    # Run as a directory, the probe is no package yet: import it from its parent directory (the
    # mount point, sys.path[0] as when the probe was one file), under the directory's own name.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(_here)
    __package__ = os.path.basename(_here)

from .run import main  # after the package is importable

sys.exit(main(sys.argv[1:]))
