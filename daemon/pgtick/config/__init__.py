"""The configuration: TOML file -> frozen, typed, checked dataclasses.

Every refusal is one ``ConfigError`` line naming the full key. Pure: no network, no database.
May import ``pgtick.scheduling`` (to check cron expressions and time zones) and
``pgtick.errors``, nothing else of pgtick.
"""
