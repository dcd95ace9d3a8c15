"""jobqueue: a job queue in a MySQL table with a Flask operations dashboard.

`webapp.core` is the queue (no Flask below this line); `webapp.web` is the dashboard and API.
"""


def create_app(test_config=None):
    """Flask application factory (see webapp.web). Imported lazily so that workers and the CLI
    never import Flask."""
    from .web import create_app as _create_app

    return _create_app(test_config)
