"""The PostgreSQL connector: a two-phase-commit sink on PREPARE TRANSACTION (docs/POSTGRES.md).

Registered as the connector of kind `postgres` (entry point group `eos.connectors`).
"""

from eos.api import Connector
from eos_connectors.postgres.sink import PostgresSink

connector = Connector("postgres", sink=PostgresSink)
