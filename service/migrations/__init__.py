"""Alembic's migration environment for the coordinator's database (env.py, script.py.mako, versions/),
shipped inside the package; service.migrate drives it without an alembic.ini."""
