"""Cron semantics: occurrences of an expression in a time zone, the DST rules, jitter.

Pure (no I/O, no clock but the one passed in): tested exhaustively without a database. May
import only ``pgtick.errors``; ``pgtick.config`` imports it to validate schedules.
"""
