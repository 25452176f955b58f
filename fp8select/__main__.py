"""``python -m fp8select``."""

import sys

from fp8select.cli import main

sys.exit(main())
