"""Tools for running shardq on one machine: the local cluster (`shardq dev`), its demo load,
and the redis-server processes they (and the tests) start."""
