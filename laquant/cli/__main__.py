"""``python -m laquant.cli``: the ``laquant`` command."""

import sys

from laquant.cli import main

sys.exit(main())
