"""The operator's dashboard at /ui: server-rendered pages (Jinja) over the same service functions as the
/v1 read endpoints. Chart.js and htmx are vendored under static/vendor (exact versions, licences, SHA256SUMS);
every chart's numbers are also a table; the CSP allows nothing but this origin and no inline code."""

from fedzoo.server.dashboard.views import blueprint

__all__ = ["blueprint"]
