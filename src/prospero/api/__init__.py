"""prosperod's HTTP API (FastAPI): `prospero.api.app.create_app(runtime)`; run it with
`prospero.api.server.ApiServer` (uvicorn inside the caller's event loop)."""
