"""``python -m shardq.coordinator.cli``: the ``shardq`` command."""

import sys

from shardq.coordinator.cli import main

sys.exit(main())
