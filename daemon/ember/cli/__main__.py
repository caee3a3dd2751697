"""``python -m ember.cli``: the ``ember`` command."""

import sys

from . import main

sys.exit(main())
