"""``python -m ppqlike`` is the ``ppqlike`` command."""

import sys

from .cli import main

sys.exit(main())
