"""upgrade: every opset-8 (batched) Scan becomes an equivalent opset-9+ construction.

The package: ``upgrade_pass`` (the pass: pick a strategy, rewrite; its docstring says
which strategy applies when), ``proof`` (a Scan-8 body is batch-polymorphic),
``batched`` (strategy (b): one Scan-9 over time) and ``per_item`` (strategy (c): a loop
over batch items).
"""

from scanopt.passes.upgrade.upgrade_pass import STRATEGY_TEXT, Upgrade, UpgradeMatch

__all__ = ["STRATEGY_TEXT", "Upgrade", "UpgradeMatch"]
