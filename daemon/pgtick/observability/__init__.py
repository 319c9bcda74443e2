"""What the daemon tells the outside about itself: Prometheus metrics, structured logs,
systemd notifications.

A leaf: imports no other part of pgtick, so every layer may use it.
"""
