"""``python -m tunecore.cli``: the same as the ``tunecore`` command."""

import sys

from tunecore.cli import main

sys.exit(main())
