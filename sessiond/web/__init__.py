"""The web console (docs/design.md section 11): pages, the API, logins and /metrics,
served by the daemon in its own loop on ``[web] listen`` (docs/web.md)."""
