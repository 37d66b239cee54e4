"""The PostgreSQL backend (asyncpg), for clustered prosperod replicas sharing one database:
the event store (`events`), config store (`config`), agent metadata (`agents`) and permission
decisions (`decisions`), over one connection pool and the versioned migrations in `db`. It
implements the same seams as `core/store/sqlite` and passes the same conformance suites."""
