"""The fleet's metadata in PostgreSQL (``--metadata-url postgresql://USER@HOST:PORT/DB``).

- *Driver: psycopg 3* with ``psycopg_pool``. One driver gives the async pool for the request path, a plain
  blocking connection for the lease renewal thread (off the event loop: a busy loop cannot lose a lease) and
  ``LISTEN``/``NOTIFY`` as an async iterator; asyncpg has no blocking API, so it would need a second driver.
- *The database's clock decides leases*: every expiry is ``now() + ttl`` and every check ``expires > now()``, in
  SQL; no node's clock is compared with another's.
- *A grant is one statement* (``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` free or expired): the row lock makes
  exactly one contender win, and each new holder gets ``epoch + 1``.
- *The commit is fenced*: :meth:`fence` locks the lease row (``FOR UPDATE``) and checks owner and epoch; a new
  grant waits on that lock until the commit ends, and a frozen committer's transaction is ended by the server
  (``idle_in_transaction_session_timeout``), so it cannot hold the others for long.
- *Changes are announced* with ``NOTIFY hf_mirror_leases, '<etag>'`` on grant, release and commit; one listening
  connection per process wakes the waiters of that etag.
- *Evictions are the fleet's* (:meth:`decide_eviction`): one transaction locks the busy marks' table against writes
  (``SHARE ROW EXCLUSIVE``: evictors serialize, readers of it do not wait), picks the least recently read blobs
  that no pin, mark, lease or other eviction holds, and records them as under way. A node publishing a mark either
  commits before (the decision sees it) or after (then its next statement sees the record). The deletes done,
  ``NOTIFY hf_mirror_evictions, '<etag>'`` tells every node to drop its copy.
- *Upstream's answers* (API JSON, listings, the route table's reads) are rows keyed by the index's own key, with an
  expiry (:data:`ANSWER_KEEP`, :data:`IMMUTABLE_KEEP`): anyone can make a node ask for any listing, so the table is
  culled of expired rows, a batch at a time, by the nodes that write to it.
- *Reads a node can do without* (it asks upstream instead) wait at most :attr:`read_timeout` for a connection: a
  database that went away costs a request that long, not the pool's full connect timeout.
- *Migrations* are numbered SQL scripts applied at start, in one transaction under an advisory lock, so nodes
  starting together apply each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from mirror.errors import LeaseLost, MetadataUnavailable, redact_url
from mirror.hf import RepoRef
from mirror.index import ApiEntry, FileEntry
from mirror.metadata.announce import Announcements, Subscription
from mirror.metadata.base import (
    EVICTION_GRACE,
    AnswerRecord,
    HeldLease,
    LeaseRecord,
    RefRecord,
    WindowsRecord,
    XetRecord,
)
from mirror.storage.base import BlobInfo, PeerAddress

log = logging.getLogger("hf_mirror.metadata")

CHANNEL = "hf_mirror_leases"
EVICTIONS = "hf_mirror_evictions"  # NOTIFY payload: an etag evicted from the shared store
_BUSY_STALE = 3600.0  # a mark expired this long ago (its node died) is deleted at the next decision
_DONE_KEPT = 86400.0  # finished evictions are remembered this long (a node that lost its channel catches up)
_MIGRATION_LOCK = 0x6866_6D69  # pg_advisory_xact_lock key: "hfmi"
ANSWER_KEEP = 86400.0  # seconds a branch's answer (or a route-table read) is kept: served fresh within the ttl only
IMMUTABLE_KEEP = 30 * 86400.0  # seconds an answer at a commit is kept (it never changes; it is only asked again)
JOB_KEEP = 86400.0  # seconds a warm job's state is kept after its last update
_CULL_EVERY = 256  # a node culls expired answers after this many of its writes
_CULL_BATCH = 1000  # rows one cull deletes at most (a short statement, whatever the backlog)

# Append only: a script, once released, is never edited (nodes record the versions they applied).
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE hf_mirror_fill_leases (
        etag        text PRIMARY KEY,
        owner       text,                   -- NULL: free
        epoch       bigint NOT NULL,        -- grows at every grant to a new holder: fences stale holders
        expires     timestamptz NOT NULL,   -- the database's clock
        peer_url    text,
        peer_token  text
    );
    CREATE TABLE hf_mirror_refs (
        repo        text NOT NULL,
        revision    text NOT NULL,
        commit      text NOT NULL,
        fetched_at  timestamptz NOT NULL,
        PRIMARY KEY (repo, revision)
    );
    CREATE TABLE hf_mirror_pins (
        repo        text PRIMARY KEY,
        source      text NOT NULL,
        pinned_at   timestamptz NOT NULL DEFAULT now()
    );
    """,
    """
    CREATE TABLE hf_mirror_files (
        repo        text NOT NULL,
        commit      text NOT NULL,
        path        text NOT NULL,
        etag        text NOT NULL,          -- '' for a remembered 404
        size        bigint NOT NULL,
        lfs         boolean NOT NULL,
        missing     boolean NOT NULL,
        PRIMARY KEY (repo, commit, path)
    );
    CREATE INDEX hf_mirror_files_by_repo ON hf_mirror_files (repo);
    CREATE TABLE hf_mirror_access (
        subject       text NOT NULL,        -- a token's digest, or 'public'; never a token
        kind          text NOT NULL,
        repo          text NOT NULL,
        allowed       boolean NOT NULL,
        confirmed_at  timestamptz NOT NULL,
        PRIMARY KEY (subject, kind, repo)
    );
    """,
    """
    CREATE TABLE hf_mirror_busy (
        etag        text NOT NULL,
        node        text NOT NULL,          -- one process of a node (its busy-marks id)
        expires     timestamptz NOT NULL,   -- the database's clock; renewed while the blob is read or filled
        PRIMARY KEY (etag, node)
    );
    CREATE INDEX hf_mirror_busy_by_node ON hf_mirror_busy (node);
    CREATE TABLE hf_mirror_reads (
        etag        text PRIMARY KEY,
        last_read   timestamptz NOT NULL    -- the fleet's LRU order
    );
    CREATE TABLE hf_mirror_evictions (
        etag         text PRIMARY KEY,
        node         text NOT NULL,
        state        text NOT NULL,          -- 'evicting' (decided, deletes under way) or 'done'
        decided_at   timestamptz NOT NULL,
        finished_at  timestamptz
    );
    CREATE INDEX hf_mirror_evictions_finished ON hf_mirror_evictions (finished_at) WHERE state = 'done';
    CREATE INDEX hf_mirror_files_by_etag ON hf_mirror_files (etag);
    """,
    """
    CREATE TABLE hf_mirror_answers (
        key         text PRIMARY KEY,       -- JSON of the index key's parts (api or read)
        repo        text,                   -- the repo an API answer is of; NULL for a route-table read
        status      integer NOT NULL,
        headers     jsonb NOT NULL,         -- [[name, value], ...] in upstream's order
        body        bytea NOT NULL,
        immutable   boolean NOT NULL,       -- at a commit: fresh forever
        fetched_at  timestamptz NOT NULL,
        expires     timestamptz NOT NULL
    );
    CREATE INDEX hf_mirror_answers_by_expiry ON hf_mirror_answers (expires);
    CREATE TABLE hf_mirror_xet (
        repo        text NOT NULL,
        commit      text NOT NULL,
        path        text NOT NULL,
        xet_hash    text NOT NULL,
        etag        text NOT NULL,          -- the LFS sha256 the mirror verifies
        size        bigint NOT NULL,
        PRIMARY KEY (repo, commit, path)
    );
    CREATE INDEX hf_mirror_xet_by_hash ON hf_mirror_xet (repo, xet_hash);
    CREATE TABLE hf_mirror_secrets (
        name        text PRIMARY KEY,
        value       bytea NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE hf_mirror_warm_jobs (
        id          text PRIMARY KEY,
        identity    text NOT NULL,          -- what it warms and for whom (a token's digest, never a token)
        state       jsonb NOT NULL,         -- the job's status JSON, as GET /api/mirror/warm/{id} answers it
        active      boolean NOT NULL,       -- holds the identity's claim (one live job per warm)
        expires     timestamptz NOT NULL,   -- the claim's end, extended while the job runs
        kept_until  timestamptz NOT NULL
    );
    CREATE UNIQUE INDEX hf_mirror_warm_jobs_claim ON hf_mirror_warm_jobs (identity) WHERE active;
    """,
    """
    CREATE TABLE hf_mirror_windows (
        etag         text NOT NULL,
        node_url     text NOT NULL,         -- the node whose sparse partial file holds them (its --node-url)
        token        text NOT NULL,         -- what its peer route asks of a read of them
        held         jsonb NOT NULL,        -- [[start, done], ...] when recorded
        recorded_at  timestamptz NOT NULL,
        PRIMARY KEY (etag, node_url)
    );
    """,
)

_P = ParamSpec("_P")
_T = TypeVar("_T")


def database_errors(func: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """Driver and pool failures become a MirrorError (a clear 503), never a bare 500."""

    @functools.wraps(func)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await func(*args, **kwargs)
        except (psycopg.Error, TimeoutError) as exc:
            raise MetadataUnavailable(f"metadata database failed during {func.__name__}: {exc}") from exc

    return wrapper


class PostgresMetadata:
    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout: float = 10.0,
                 fence_timeout: float = 30.0, read_timeout: float = 2.0) -> None:
        self.url = url
        self.read_timeout = read_timeout
        self._writes = 0  # answers written by this process (a cull every _CULL_EVERY)
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self.fence_timeout = fence_timeout
        self._pool: AsyncConnectionPool | None = None
        self._announcements = Announcements()
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._renewal_conn: psycopg.Connection[Any] | None = None
        self._renewal_lock = threading.Lock()
        self._busy_conn: psycopg.Connection[Any] | None = None  # the busy marks' thread's own connection
        self._busy_lock = threading.Lock()
        self._evicted: list[Callable[[str], None]] = []
        self._listened_at: datetime | None = None  # the database's clock when the channel was last (re)joined

    def __repr__(self) -> str:
        return f"PostgresMetadata({redact_url(self.url)})"

    async def open(self) -> None:
        pool = AsyncConnectionPool(self.url, min_size=1, max_size=self.pool_size, open=False,
                                   kwargs={"autocommit": True}, timeout=self.connect_timeout,
                                   check=AsyncConnectionPool.check_connection)
        try:
            await pool.open(wait=True, timeout=self.connect_timeout)
        except psycopg.Error as exc:
            await pool.close()
            raise MetadataUnavailable(f"metadata database {redact_url(self.url)} is not usable: {exc}") from exc
        except TimeoutError as exc:  # psycopg_pool's PoolTimeout is one
            await pool.close()
            raise MetadataUnavailable(f"metadata database {redact_url(self.url)} did not answer") from exc
        self._pool = pool
        await self._migrate()
        self._listener = asyncio.create_task(self._listen(), name="metadata:listen")
        with contextlib.suppress(TimeoutError):  # it reconnects by itself; waiters have timeouts meanwhile
            await asyncio.wait_for(self._listening.wait(), self.connect_timeout)

    async def aclose(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        with self._renewal_lock:
            if self._renewal_conn is not None:
                self._renewal_conn.close()
                self._renewal_conn = None
        with self._busy_lock:
            if self._busy_conn is not None:
                self._busy_conn.close()
                self._busy_conn = None

    @property
    def pool(self) -> AsyncConnectionPool:
        if self._pool is None:
            raise MetadataUnavailable("the metadata store is not open")
        return self._pool

    def _reading(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A connection for a read the node can do without: a short wait for it (see the module's notes)."""
        return self.pool.connection(timeout=self.read_timeout)

    @database_errors
    async def _migrate(self) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute("CREATE TABLE IF NOT EXISTS hf_mirror_schema ("
                               "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
            row = await (await conn.execute("SELECT coalesce(max(version), 0) FROM hf_mirror_schema")).fetchone()
            current = int(row[0]) if row else 0
            if current > len(MIGRATIONS):
                raise MetadataUnavailable(f"the metadata database has schema version {current}, newer than this "
                                          f"node knows ({len(MIGRATIONS)}): upgrade the node")
            for version, script in enumerate(MIGRATIONS[current:], start=current + 1):
                await conn.execute(script)
                await conn.execute("INSERT INTO hf_mirror_schema (version) VALUES (%s)", (version,))
                log.info("metadata schema migrated to version %d", version)

    async def _listen(self) -> None:
        while True:
            try:
                # libpq's connect_timeout is whole seconds, and 0 would wait for ever.
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True,
                                                             connect_timeout=max(1, math.ceil(self.connect_timeout)))
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    await conn.execute(f"LISTEN {EVICTIONS}")
                    await self._catch_up_evictions(conn)
                    self._listening.set()
                    self._announcements.announce_all()  # whatever happened while we were not listening
                    async for note in conn.notifies():
                        if note.channel == EVICTIONS:
                            self._tell_evicted(note.payload)
                        else:
                            self._announcements.announce(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database restarts: listen again; waiters time out meanwhile
                if self._listening.is_set():
                    log.warning("lost the metadata notification channel: %s", exc)
            self._listening.clear()
            self._announcements.announce_all()
            await asyncio.sleep(1.0)

    async def _catch_up_evictions(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Once listening again: the evictions finished since the channel was last joined (their notes were lost)."""
        row = await (await conn.execute("SELECT now()")).fetchone()
        since, self._listened_at = self._listened_at, row[0] if row else None
        if since is None:
            return
        rows = await (await conn.execute(
            "SELECT etag FROM hf_mirror_evictions WHERE state = 'done' AND finished_at >= %s", (since,))).fetchall()
        for (etag,) in rows:
            self._tell_evicted(str(etag))

    def _tell_evicted(self, etag: str) -> None:
        for callback in self._evicted:
            try:
                callback(etag)
            except Exception:  # noqa: BLE001 - one listener's failure must not stop the channel
                log.exception("eviction listener failed on %s", etag)

    # --- refs -------------------------------------------------------------------------------------------------------

    @database_errors
    async def get_ref(self, repo: RepoRef, revision: str) -> RefRecord | None:
        async with self._reading() as conn:
            row = await (await conn.execute(
                "SELECT commit, greatest(extract(epoch FROM now() - fetched_at), 0) FROM hf_mirror_refs "
                "WHERE repo = %s AND revision = %s", (repo.key, revision))).fetchone()
        return None if row is None else RefRecord(str(row[0]), float(row[1]))

    @database_errors
    async def put_ref(self, repo: RepoRef, revision: str, commit: str) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO hf_mirror_refs (repo, revision, commit, fetched_at) VALUES (%s, %s, %s, now()) "
                "ON CONFLICT (repo, revision) DO UPDATE SET commit = EXCLUDED.commit, fetched_at = EXCLUDED.fetched_at",
                (repo.key, revision, commit))

    # --- files -------------------------------------------------------------------------------------------------------

    @database_errors
    async def get_file(self, repo: RepoRef, commit: str, path: str) -> FileEntry | None:
        async with self._reading() as conn:
            row = await (await conn.execute(
                "SELECT etag, size, lfs, missing FROM hf_mirror_files WHERE repo = %s AND commit = %s AND path = %s",
                (repo.key, commit, path))).fetchone()
        return None if row is None else FileEntry(commit, path, str(row[0]), int(row[1]), bool(row[2]), bool(row[3]))

    @database_errors
    async def put_file(self, repo: RepoRef, entry: FileEntry) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO hf_mirror_files (repo, commit, path, etag, size, lfs, missing) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (repo, commit, path) DO UPDATE SET "
                "etag = EXCLUDED.etag, size = EXCLUDED.size, lfs = EXCLUDED.lfs, missing = EXCLUDED.missing",
                (repo.key, entry.commit, entry.path, entry.etag, entry.size, entry.lfs, entry.missing))

    # --- access confirmations ---------------------------------------------------------------------------------------

    @database_errors
    async def get_access(self, subject: str, kind: str, repo: RepoRef) -> tuple[bool, float] | None:
        async with self._reading() as conn:
            row = await (await conn.execute(
                "SELECT allowed, greatest(extract(epoch FROM now() - confirmed_at), 0) FROM hf_mirror_access "
                "WHERE subject = %s AND kind = %s AND repo = %s", (subject, kind, repo.key))).fetchone()
        return None if row is None else (bool(row[0]), float(row[1]))

    @database_errors
    async def put_access(self, subject: str, kind: str, repo: RepoRef, allowed: bool) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO hf_mirror_access (subject, kind, repo, allowed, confirmed_at) "
                "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (subject, kind, repo) DO UPDATE SET "
                "allowed = EXCLUDED.allowed, confirmed_at = EXCLUDED.confirmed_at", (subject, kind, repo.key, allowed))

    # --- upstream's answers ----------------------------------------------------------------------------------------

    @database_errors
    async def get_api(self, repo: RepoRef, revision: str | None, route: str, query: str) -> AnswerRecord | None:
        return await self._get_answer(_api_key(repo, revision, route, query))

    @database_errors
    async def put_api(self, repo: RepoRef, revision: str | None, route: str, query: str, entry: ApiEntry) -> None:
        await self._put_answer(_api_key(repo, revision, route, query), repo.key, entry)

    @database_errors
    async def get_read(self, path: str, subject: str, query: str) -> AnswerRecord | None:
        return await self._get_answer(_read_key(path, subject, query))

    @database_errors
    async def put_read(self, path: str, subject: str, query: str, entry: ApiEntry) -> None:
        await self._put_answer(_read_key(path, subject, query), None, entry)

    async def _get_answer(self, key: str) -> AnswerRecord | None:
        async with self._reading() as conn:
            row = await (await conn.execute(
                "SELECT status, headers, body, immutable, greatest(extract(epoch FROM now() - fetched_at), 0) "
                "FROM hf_mirror_answers WHERE key = %s AND expires > now()", (key,))).fetchone()
        if row is None:
            return None
        status, headers, body, immutable, age = row
        pairs = tuple((str(name), str(value)) for name, value in headers)
        entry = ApiEntry(int(status), pairs, bytes(body), 0.0, immutable=bool(immutable))
        return AnswerRecord(entry, float(age))

    async def _put_answer(self, key: str, repo: str | None, entry: ApiEntry) -> None:
        keep = IMMUTABLE_KEEP if entry.immutable else ANSWER_KEEP
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO hf_mirror_answers (key, repo, status, headers, body, immutable, fetched_at, expires) "
                "VALUES (%s, %s, %s, %s, %s, %s, now(), now() + make_interval(secs => %s)) ON CONFLICT (key) DO UPDATE "
                "SET status = EXCLUDED.status, headers = EXCLUDED.headers, body = EXCLUDED.body, "
                "immutable = EXCLUDED.immutable, fetched_at = EXCLUDED.fetched_at, expires = EXCLUDED.expires",
                (key, repo, entry.status, Jsonb([list(pair) for pair in entry.headers]), entry.body, entry.immutable,
                 keep))
            self._writes += 1
            if self._writes % _CULL_EVERY == 0:
                await conn.execute(
                    "DELETE FROM hf_mirror_answers WHERE key IN "
                    "(SELECT key FROM hf_mirror_answers WHERE expires <= now() LIMIT %s)", (_CULL_BATCH,))

    # --- Xet records ------------------------------------------------------------------------------------------------

    @database_errors
    async def get_xet_files(self, repo: RepoRef, commit: str, paths: list[str]) -> list[XetRecord]:
        if not paths:
            return []
        async with self._reading() as conn:
            rows = await (await conn.execute(
                "SELECT commit, path, xet_hash, etag, size FROM hf_mirror_xet "
                "WHERE repo = %s AND commit = %s AND path = ANY(%s)", (repo.key, commit, list(paths)))).fetchall()
        return [XetRecord(str(c), str(p), str(h), str(e), int(n)) for c, p, h, e, n in rows]

    @database_errors
    async def get_xet_by_hash(self, repo: RepoRef, xet_hash: str) -> XetRecord | None:
        async with self._reading() as conn:
            row = await (await conn.execute(
                "SELECT commit, path, xet_hash, etag, size FROM hf_mirror_xet WHERE repo = %s AND xet_hash = %s "
                "LIMIT 1", (repo.key, xet_hash))).fetchone()
        return None if row is None else XetRecord(str(row[0]), str(row[1]), str(row[2]), str(row[3]), int(row[4]))

    @database_errors
    async def put_xet_files(self, repo: RepoRef, records: list[XetRecord]) -> None:
        if not records:
            return
        async with self.pool.connection() as conn:
            await conn.execute(  # one statement for a whole listing page
                "INSERT INTO hf_mirror_xet (repo, commit, path, xet_hash, etag, size) "
                "SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[]) "
                "ON CONFLICT (repo, commit, path) DO UPDATE SET xet_hash = EXCLUDED.xet_hash, etag = EXCLUDED.etag, "
                "size = EXCLUDED.size",
                (repo.key, [r.commit for r in records], [r.path for r in records], [r.xet_hash for r in records],
                 [r.etag for r in records], [r.size for r in records]))

    # --- secrets ----------------------------------------------------------------------------------------------------

    @database_errors
    async def secret(self, name: str, candidate: bytes) -> bytes:
        async with self.pool.connection() as conn:
            await conn.execute("INSERT INTO hf_mirror_secrets (name, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                               (name, candidate))
            row = await (await conn.execute("SELECT value FROM hf_mirror_secrets WHERE name = %s",
                                            (name,))).fetchone()
        if row is None:
            raise MetadataUnavailable(f"the secret {name} was not stored")
        return bytes(row[0])

    # --- warm jobs ---------------------------------------------------------------------------------------------------

    @database_errors
    async def claim_job(self, identity: str, job_id: str, state: dict[str, Any], ttl: float) -> dict[str, Any] | None:
        async with self.pool.connection() as conn, conn.transaction():
            # A claim whose job stopped publishing (its node died) is given up first.
            await conn.execute("UPDATE hf_mirror_warm_jobs SET active = false "
                               "WHERE identity = %s AND active AND expires <= now()", (identity,))
            row = await (await conn.execute(
                "INSERT INTO hf_mirror_warm_jobs (id, identity, state, active, expires, kept_until) "
                "VALUES (%s, %s, %s, true, now() + make_interval(secs => %s), now() + make_interval(secs => %s)) "
                "ON CONFLICT (identity) WHERE active DO NOTHING RETURNING id",
                (job_id, identity, Jsonb(state), ttl, JOB_KEEP))).fetchone()
            if row is not None:
                return None
            held = await (await conn.execute(
                "SELECT state FROM hf_mirror_warm_jobs WHERE identity = %s AND active", (identity,))).fetchone()
        return dict(held[0]) if held is not None else None

    @database_errors
    async def update_job(self, job_id: str, state: dict[str, Any], ttl: float, *, finished: bool = False) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE hf_mirror_warm_jobs SET state = %s, active = active AND NOT %s, "
                "expires = now() + make_interval(secs => %s), kept_until = now() + make_interval(secs => %s) "
                "WHERE id = %s", (Jsonb(state), finished, ttl, JOB_KEEP, job_id))
            self._writes += 1
            if self._writes % _CULL_EVERY == 0:
                await conn.execute("DELETE FROM hf_mirror_warm_jobs WHERE NOT active AND kept_until <= now()")

    @database_errors
    async def get_job(self, job_id: str) -> dict[str, Any] | None:
        async with self._reading() as conn:
            row = await (await conn.execute(
                "SELECT state FROM hf_mirror_warm_jobs WHERE id = %s AND kept_until > now()", (job_id,))).fetchone()
        return None if row is None else dict(row[0])

    # --- pins -------------------------------------------------------------------------------------------------------

    @database_errors
    async def pin(self, repo: RepoRef, source: str) -> None:
        async with self.pool.connection() as conn:
            await conn.execute("INSERT INTO hf_mirror_pins (repo, source) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                               (repo.key, source))

    @database_errors
    async def unpin(self, repo: RepoRef) -> str | None:
        async with self.pool.connection() as conn:
            row = await (await conn.execute("DELETE FROM hf_mirror_pins WHERE repo = %s RETURNING source",
                                            (repo.key,))).fetchone()
        return None if row is None else str(row[0])

    @database_errors
    async def pins(self) -> dict[str, str]:
        async with self.pool.connection() as conn:
            rows = await (await conn.execute("SELECT repo, source FROM hf_mirror_pins")).fetchall()
        return {str(repo): str(source) for repo, source in rows}

    @database_errors
    async def pinned_blobs(self) -> set[str]:
        async with self.pool.connection() as conn:
            rows = await (await conn.execute(
                "SELECT DISTINCT f.etag FROM hf_mirror_files f JOIN hf_mirror_pins p ON p.repo = f.repo "
                "WHERE NOT f.missing AND f.etag <> ''")).fetchall()
        return {str(row[0]) for row in rows}

    # --- fill leases ------------------------------------------------------------------------------------------------

    @database_errors
    async def acquire_lease(self, etag: str, owner: str, ttl: float, peer: PeerAddress | None = None) -> int | None:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(
                """
                WITH granted AS (
                    INSERT INTO hf_mirror_fill_leases AS l (etag, owner, epoch, expires, peer_url, peer_token)
                    VALUES (%(etag)s, %(owner)s, 1, now() + make_interval(secs => %(ttl)s), %(url)s, %(token)s)
                    ON CONFLICT (etag) DO UPDATE SET
                        owner = EXCLUDED.owner,
                        -- the same holder renewing keeps its epoch; any other grant is a new epoch
                        epoch = CASE WHEN l.owner = EXCLUDED.owner AND l.expires > now() THEN l.epoch
                                     ELSE l.epoch + 1 END,
                        expires = EXCLUDED.expires, peer_url = EXCLUDED.peer_url, peer_token = EXCLUDED.peer_token
                    WHERE l.owner IS NULL OR l.expires <= now() OR l.owner = EXCLUDED.owner
                    RETURNING l.epoch
                )
                SELECT epoch, pg_notify(%(channel)s, %(etag)s) FROM granted
                """,
                {"etag": etag, "owner": owner, "ttl": ttl, "url": peer.url if peer else None,
                 "token": peer.token if peer else None, "channel": CHANNEL})).fetchone()
        return None if row is None else int(row[0])

    def renew_leases(self, held: Iterable[HeldLease], ttl: float) -> set[str]:
        leases = list(held)
        if not leases:
            return set()
        with self._renewal_lock:
            try:
                conn = self._renewal_connection(ttl)
                rows = conn.execute(
                    """
                    UPDATE hf_mirror_fill_leases AS l SET expires = now() + make_interval(secs => %s)
                    FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS h(etag, owner, epoch)
                    WHERE l.etag = h.etag AND l.owner = h.owner AND l.epoch = h.epoch
                    RETURNING l.etag
                    """,
                    (ttl, [lease.etag for lease in leases], [lease.owner for lease in leases],
                     [lease.epoch for lease in leases])).fetchall()
            except psycopg.Error:
                if self._renewal_conn is not None:
                    self._renewal_conn.close()
                    self._renewal_conn = None
                raise
        return {str(row[0]) for row in rows}

    def _renewal_connection(self, ttl: float) -> psycopg.Connection[Any]:
        """The renewal thread's own connection: a pool shared with the requests could make it wait its turn."""
        if self._renewal_conn is None or self._renewal_conn.closed:
            # A renewal that cannot finish within a third of the ttl is as good as failed: do not hang on it.
            budget_ms = max(int(ttl * 1000 / 3), 200)
            self._renewal_conn = psycopg.connect(self.url, autocommit=True,
                                                 connect_timeout=max(int(ttl / 3), 1),
                                                 options=f"-c statement_timeout={budget_ms}")
        return self._renewal_conn

    @database_errors
    async def release_lease(self, etag: str, owner: str, epoch: int) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                """
                WITH freed AS (
                    UPDATE hf_mirror_fill_leases SET owner = NULL, expires = now(), peer_url = NULL, peer_token = NULL
                    WHERE etag = %(etag)s AND owner = %(owner)s AND epoch = %(epoch)s RETURNING etag
                )
                SELECT pg_notify(%(channel)s, etag) FROM freed
                """, {"etag": etag, "owner": owner, "epoch": epoch, "channel": CHANNEL})

    @database_errors
    async def read_lease(self, etag: str) -> LeaseRecord | None:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(
                "SELECT owner, epoch, extract(epoch FROM expires - now()), peer_url, peer_token "
                "FROM hf_mirror_fill_leases WHERE etag = %s AND owner IS NOT NULL AND expires > now()",
                (etag,))).fetchone()
        if row is None:
            return None
        peer = PeerAddress(str(row[3]), str(row[4] or "")) if row[3] else None
        return LeaseRecord(etag, str(row[0]), int(row[1]), float(row[2]), peer)

    @contextlib.asynccontextmanager
    async def fence(self, etag: str, owner: str, epoch: int) -> AsyncIterator[None]:
        try:
            async with self.pool.connection() as conn, conn.transaction():
                # A committer frozen inside the fence (SIGSTOP) holds the row lock: the server ends its transaction.
                await conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                                   (str(int(self.fence_timeout * 1000)),))
                row = await (await conn.execute(
                    "SELECT owner, epoch FROM hf_mirror_fill_leases WHERE etag = %s FOR UPDATE", (etag,))).fetchone()
                if row is None or row[0] != owner or int(row[1]) != epoch:
                    raise LeaseLost(f"the fill lease of {etag} is no longer held under epoch {epoch} "
                                    f"(now {row[0] if row else 'nobody'}, epoch {row[1] if row else '-'})")
                yield
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, etag))
        except psycopg.Error as exc:
            raise MetadataUnavailable(f"metadata database failed while fencing the commit of {etag}: {exc}") from exc

    def changed(self, etag: str) -> contextlib.AbstractAsyncContextManager[Subscription]:
        return self._announcements.changed(etag)

    # --- held windows -----------------------------------------------------------------------------------------------

    @database_errors
    async def put_windows(self, etag: str, peer: PeerAddress, held: Sequence[tuple[int, int]]) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO hf_mirror_windows (etag, node_url, token, held, recorded_at) "
                "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (etag, node_url) DO UPDATE SET "
                "token = EXCLUDED.token, held = EXCLUDED.held, recorded_at = EXCLUDED.recorded_at",
                (etag, peer.url, peer.token, Jsonb([[int(a), int(b)] for a, b in held])))

    @database_errors
    async def get_windows(self, etag: str) -> list[WindowsRecord]:
        async with self._reading() as conn:
            rows = await (await conn.execute(
                "SELECT node_url, token, held FROM hf_mirror_windows WHERE etag = %s ORDER BY recorded_at DESC",
                (etag,))).fetchall()
        return [WindowsRecord(etag, PeerAddress(str(url), str(token)), tuple((int(a), int(b)) for a, b in held))
                for url, token, held in rows]

    @database_errors
    async def drop_windows(self, etag: str, url: str | None = None, token: str | None = None) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "DELETE FROM hf_mirror_windows WHERE etag = %s AND (%s::text IS NULL OR node_url = %s) "
                "AND (%s::text IS NULL OR token = %s)", (etag, url, url, token, token))

    # --- busy marks, read times, evictions --------------------------------------------------------------------------

    def publish_busy(self, node: str, busy: Collection[str], read: Collection[str], ttl: float) -> set[str]:
        marks, stamps = sorted(set(busy)), sorted(set(read))
        with self._busy_lock:
            try:
                conn = self._busy_connection(ttl)
                with conn.transaction():
                    # First the marks (they wait for a decision in progress: its lock), then, in a statement of its
                    # own (a fresh snapshot), the evictions a decision recorded before them.
                    conn.execute(
                        "INSERT INTO hf_mirror_busy (etag, node, expires) "
                        "SELECT e, %s, now() + make_interval(secs => %s) FROM unnest(%s::text[]) AS e "
                        "ON CONFLICT (etag, node) DO UPDATE SET expires = EXCLUDED.expires", (node, ttl, marks))
                    conn.execute("DELETE FROM hf_mirror_busy WHERE node = %s AND NOT (etag = ANY(%s::text[]))",
                                 (node, marks))
                    if stamps:
                        conn.execute(
                            "INSERT INTO hf_mirror_reads (etag, last_read) SELECT e, now() FROM unnest(%s::text[]) e "
                            "ON CONFLICT (etag) DO UPDATE SET last_read = EXCLUDED.last_read", (stamps,))
                    rows = conn.execute(
                        "SELECT etag FROM hf_mirror_evictions WHERE etag = ANY(%s::text[]) AND state = 'evicting' "
                        "AND decided_at > now() - make_interval(secs => %s)", (marks, EVICTION_GRACE)).fetchall()
            except psycopg.Error:
                if self._busy_conn is not None:
                    self._busy_conn.close()
                    self._busy_conn = None
                raise
        return {str(row[0]) for row in rows}

    def _busy_connection(self, ttl: float) -> psycopg.Connection[Any]:
        """The busy marks' thread's own connection (as the lease renewal's: never behind the requests' pool)."""
        if self._busy_conn is None or self._busy_conn.closed:
            budget_ms = max(int(ttl * 1000 / 3), 500)
            self._busy_conn = psycopg.connect(self.url, autocommit=True, connect_timeout=max(int(ttl / 3), 1),
                                              options=f"-c statement_timeout={budget_ms}")
        return self._busy_conn

    @database_errors
    async def decide_eviction(self, node: str, candidates: Sequence[BlobInfo], need: int | None) -> list[str]:
        if not candidates or (need is not None and need <= 0):
            return []
        async with self.pool.connection() as conn, conn.transaction():
            # A frozen evictor must not hold every node's marks for long: the server ends its transaction.
            await conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                               (str(int(self.fence_timeout * 1000)),))
            await conn.execute("LOCK TABLE hf_mirror_busy IN SHARE ROW EXCLUSIVE MODE")
            rows = await (await conn.execute(
                """
                SELECT c.etag, c.size FROM unnest(%(etags)s::text[], %(sizes)s::bigint[], %(stamps)s::float8[])
                    AS c(etag, size, stamp)
                LEFT JOIN hf_mirror_reads r ON r.etag = c.etag
                WHERE NOT EXISTS (SELECT 1 FROM hf_mirror_busy b WHERE b.etag = c.etag AND b.expires > now())
                  AND NOT EXISTS (SELECT 1 FROM hf_mirror_fill_leases l
                                  WHERE l.etag = c.etag AND l.owner IS NOT NULL AND l.expires > now())
                  AND NOT EXISTS (SELECT 1 FROM hf_mirror_files f JOIN hf_mirror_pins p ON p.repo = f.repo
                                  WHERE f.etag = c.etag AND NOT f.missing)
                  AND NOT EXISTS (SELECT 1 FROM hf_mirror_evictions e
                                  WHERE e.etag = c.etag AND e.state = 'evicting' AND e.node <> %(node)s
                                    AND e.decided_at > now() - make_interval(secs => %(grace)s))
                ORDER BY greatest(coalesce(extract(epoch FROM r.last_read), 0), c.stamp), c.etag
                """,
                {"etags": [c.etag for c in candidates], "sizes": [c.size for c in candidates],
                 "stamps": [c.last_access for c in candidates], "node": node, "grace": EVICTION_GRACE})).fetchall()
            chosen: list[str] = []
            freed = 0
            for etag, size in rows:
                if need is not None and freed >= need:
                    break
                chosen.append(str(etag))
                freed += int(size)
            if chosen:
                await conn.execute(
                    "INSERT INTO hf_mirror_evictions (etag, node, state, decided_at) "
                    "SELECT e, %s, 'evicting', now() FROM unnest(%s::text[]) AS e ON CONFLICT (etag) DO UPDATE SET "
                    "node = EXCLUDED.node, state = 'evicting', decided_at = now(), finished_at = NULL",
                    (node, chosen))
            # Housekeeping, under the same lock: the marks of dead nodes, evictions long finished.
            await conn.execute("DELETE FROM hf_mirror_busy WHERE expires < now() - make_interval(secs => %s)",
                               (_BUSY_STALE,))
            await conn.execute("DELETE FROM hf_mirror_evictions WHERE state = 'done' "
                               "AND finished_at < now() - make_interval(secs => %s)", (_DONE_KEPT,))
        return chosen

    @database_errors
    async def finish_eviction(self, node: str, deleted: Collection[str], kept: Collection[str]) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            if deleted:
                await conn.execute(
                    "UPDATE hf_mirror_evictions SET state = 'done', finished_at = now() "
                    "WHERE etag = ANY(%s::text[]) AND node = %s", (list(deleted), node))
                await conn.execute("DELETE FROM hf_mirror_reads WHERE etag = ANY(%s::text[])", (list(deleted),))
                await conn.execute("SELECT pg_notify(%s, e) FROM unnest(%s::text[]) AS e", (EVICTIONS, list(deleted)))
            if kept:
                await conn.execute("DELETE FROM hf_mirror_evictions WHERE etag = ANY(%s::text[]) AND node = %s "
                                   "AND state = 'evicting'", (list(kept), node))

    def on_evicted(self, callback: Callable[[str], None]) -> None:
        self._evicted.append(callback)


def _api_key(repo: RepoRef, revision: str | None, route: str, query: str) -> str:
    """The index's API key, as JSON (unambiguous whatever a path or query holds)."""
    return json.dumps(["api", repo.type.value, repo.repo_id, revision, route, query], separators=(",", ":"))


def _read_key(path: str, subject: str, query: str) -> str:
    return json.dumps(["read", path, subject, query], separators=(",", ":"))
