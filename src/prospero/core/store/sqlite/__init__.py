"""The embedded SQLite backend (one `events.db`): the event store (`events`, with its schema,
batch insert and inline appender in `schema`, `insert`, `inline`), the config store
(`config`), agent metadata (`agents`) and permission decisions (`decisions`), over the shared
connection helpers in `db`. The PostgreSQL backend (`core/store/postgres`) implements the same
seams (`core/store/base.py`, `core/store/decisions.py`) and passes the same conformance suites."""
