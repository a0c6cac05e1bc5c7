"""``python -m ppqlike.cli``: the ``ppqlike`` command line."""

import sys

from .main import main

sys.exit(main())
