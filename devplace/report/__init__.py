"""Writing a comparison to a folder: tables, plots, the best placement's trace, and report.html."""

from devplace.report.write import write_report

__all__ = ["write_report"]
