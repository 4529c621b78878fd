"""The training methods, by name, defined once for the API, the loop and the trainer.

A dataset snapshot is frozen for one method, which decides the candidate view it reads
(sql/train/create_snapshot.sql: train.sft_candidate, train.kto_candidate, train.pair_candidate
for dpo, orpo and simpo) and the format of its examples (app/datasets/service.py). How each
method trains, its hyperparameters and their limits, is app/training/methods.py.
"""

from __future__ import annotations

from typing import Literal, get_args

Method = Literal["sft", "dpo", "kto", "orpo", "simpo"]
METHODS: tuple[Method, ...] = get_args(Method)
