"""The shardq coordinator: gRPC API, tenant placement and the Python client."""
