"""``python -m hostcb`` runs the ``hostcb`` command."""
import sys

from hostcb.cli import main

sys.exit(main())
