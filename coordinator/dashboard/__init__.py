"""The shardq dashboard: a web UI over the public gRPC API (``shardq dashboard``).

A client of the coordinator like any other (it may import ``shardq.client``, ``shardq.v1`` and
``shardq.common`` only): every page is one or a few API calls made with the token of the
logged-in user, so the API decides what a token may see. ``app`` builds the ASGI app
(Starlette, Jinja2 pages, htmx for the live parts), ``sessions`` keeps logins server side,
``samples`` keeps the last hour of cluster totals for the charts, ``server`` runs it.
"""
