"""shardq v1 API: the ``*.proto`` sources and the gRPC/protobuf code generated from them.

Regenerate with ``python proto/generate.py``; never edit the ``*_pb2*`` files by hand.
"""
