"""``python -m hostcb`` runs the ``hostcb`` command."""

import sys

from hostcb.tools.cli import main

sys.exit(main())
