"""AGL trainer: verl consuming the ledger's terminal stream.

Importing this package is cheap: verl, torch and Ray are imported only by the modules that need them
(`batch`, `advantage`, `loss`, `ppo_trainer`, `runner`), so the manager and the pure data path stay light.
"""

from __future__ import annotations
