"""Tools for running shardq on one machine: the local cluster (``shardq dev``, the ``dev``
package), its demo load (``demo.py``), what both read from the dev data dir
(``data_dir.py``: neither tool imports the other) and the redis-server processes they (and the
tests) start (``redis_server.py``)."""
