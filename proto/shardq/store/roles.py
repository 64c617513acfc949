"""A Postgres role per kind of process, each with only the tables it needs
(``shardq migrate --roles``; docs/security.md).

============  =================================================================================
role          may
============  =================================================================================
coordinator   read tokens; read and write the shard map (shards, slots, pins, moves, its
              version), the worker registry and tenant limits; read and purge result rows
worker        read and write result rows (insert one; replace a ``dead`` row): what the
              handlers' process needs to record a job, and nothing that grants or routes
loop          the same as the worker: the shard loop writes the rows of jobs that ended
              without one and reconciles rows with Redis
============  =================================================================================

Tokens are created and revoked only through the migrator's URL (``shardq tokens``): no
process role may write them, so handler code that reads its worker's database password cannot
mint itself an admin token. The migrator owns the schema; nothing here touches it.

Roles are cluster-wide in Postgres, so their names carry a prefix (``--role-prefix``,
default: the database's name and ``_``): two installations in one Postgres cluster, each in
its own database, get roles of their own. Each run revokes every privilege the role holds on
shardq's tables and grants the list below again, in one transaction, so a grant made by
hand or left by an older version does not linger. A role is created NOLOGIN unless a password
is given for it (``SHARDQ_DB_PASSWORD_<ROLE>``): without one it is a group role to grant to
login users of your own (``GRANT shardq_worker TO alice``), e.g. with a cloud IAM login.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from psycopg import sql

from shardq.store import db
from shardq.store.migrate import MIGRATION_LOCK_KEY

_MAP = (db.shards, db.slots, db.pins, db.moves, db.map_version)

#: Per role: (privileges, tables).
GRANTS: dict[str, tuple[tuple[str, tuple[sa.Table, ...]], ...]] = {
    "coordinator": (
        ("SELECT", (db.tokens,)),
        ("SELECT, INSERT, UPDATE, DELETE", (*_MAP, db.workers, db.tenant_limits)),
        ("SELECT, DELETE", (db.results,)),
    ),
    "worker": (("SELECT, INSERT, UPDATE", (db.results,)),),
    "loop": (("SELECT, INSERT, UPDATE", (db.results,)),),
}
ROLES = tuple(GRANTS)

#: What a role name may be made of: it is also spelled in URLs and Kubernetes secrets.
_NAME_RE = re.compile(r"[a-z_][a-z0-9_]{0,50}")


def password_variable(role: str) -> str:
    """The environment variable that carries a role's password (never a flag: ``ps`` shows
    flags)."""
    return f"SHARDQ_DB_PASSWORD_{role.upper()}"


def default_prefix(url: str) -> str:
    """``<database>_``, from the migrator's URL (``shardq`` → ``shardq_worker``)."""
    name = sa.engine.make_url(db.sqlalchemy_url(url)).database or "shardq"
    return re.sub(r"[^a-z0-9_]", "_", name.lower()) + "_"


@dataclass(frozen=True, slots=True)
class Applied:
    role: str
    name: str
    login: bool


def apply_roles(url: str, prefix: str, passwords: Mapping[str, str]) -> list[Applied]:
    """Create (if missing) each role ``<prefix><role>`` and give it exactly its grants.

    Runs in one transaction under the migration lock, so it never sees a half-migrated schema
    and concurrent runs take turns; a failure changes nothing.
    """
    unknown = set(passwords) - set(ROLES)
    if unknown:
        raise ValueError(f"no such role: {', '.join(sorted(unknown))}")
    applied = []
    engine = db.make_sync_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            raw = conn.connection.driver_connection
            assert raw is not None
            schema = conn.execute(sa.text("SELECT current_schema()")).scalar_one()
            for role in ROLES:
                name = f"{prefix}{role}"
                if not _NAME_RE.fullmatch(name):
                    raise ValueError(
                        f"role name {name!r}: use lowercase letters, digits and _ (at most 51)"
                    )
                ident = sql.Identifier(name)
                exists = conn.execute(
                    sa.text("SELECT 1 FROM pg_roles WHERE rolname = :n"), {"n": name}
                ).first()
                if exists is None:
                    raw.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(ident))
                password = passwords.get(role)
                if password:
                    # DDL takes no bind parameters: the password goes in as a quoted literal.
                    raw.execute(
                        sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
                            ident, sql.Literal(password)
                        )
                    )
                # shardq's tables only: grants on the application's own tables (those its
                # handlers write) are the operator's, and stay.
                raw.execute(
                    sql.SQL("REVOKE ALL ON {} FROM {}").format(
                        sql.SQL(", ").join(
                            sql.Identifier(t.name) for t in db.metadata.sorted_tables
                        ),
                        ident,
                    )
                )
                raw.execute(
                    sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), ident)
                )
                for privileges, tables in GRANTS[role]:
                    raw.execute(
                        sql.SQL("GRANT " + privileges + " ON {} TO {}").format(
                            sql.SQL(", ").join(sql.Identifier(t.name) for t in tables), ident
                        )
                    )
                login = conn.execute(
                    sa.text("SELECT rolcanlogin FROM pg_roles WHERE rolname = :n"), {"n": name}
                ).scalar_one()
                applied.append(Applied(role, name, bool(login)))
    finally:
        engine.dispose()
    return applied
