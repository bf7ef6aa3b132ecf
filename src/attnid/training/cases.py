"""The optimizer cases: one :class:`Case` record per case, in one registry.

Training (the optimizer and whether it rebalances), the command line's help, the
tables, the figures' colours and the workflow schema's case list all read
:data:`CASES`, so adding a case touches only this module (or one :func:`register`
call). Importing this module does not import torch: the optimizer factories import
it when called, so ``attnid tables`` stays torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from attnid.common.errors import UserError

if TYPE_CHECKING:
    import torch

    from attnid.model.gpt import GPT

# make_optimizer(model, cfg, device_type) -> torch.optim.Optimizer; ``cfg`` is an
# attnid.training.config.TrainConfig
OptimizerFactory = Callable[..., Any]


class OptimizerSettings(Protocol):
    """What the optimizer factories read of a resolved :class:`attnid.training.config.TrainConfig` (which
    imports this registry: naming the protocol, not the class, keeps the two modules out of a cycle)."""

    lr: float | None
    weight_decay: float
    momentum: float
    beta1: float
    beta2: float


@dataclass(frozen=True)
class Case:
    """One optimizer case: what it is, how it trains, and how it is drawn."""

    name: str
    label: str  # short name in figures and tables
    description: str  # one line for 'attnid train --help' (and the experiment's claim, E1-E3)
    default_lr: float  # peak learning rate when --lr is not given
    make_optimizer: OptimizerFactory
    rebalances: bool = (
        False  # moves the attention pairs along their orbits every --rebalance-every steps (E3)
    )
    # plain SGD with coupled L2 decay (--weight-decay), no momentum: its first-order imbalance drift is
    # predicted exactly, L_t = -2 lr_t wd I_t (docs/design.md §7), and logged as drift1_pred_*
    coupled_weight_decay: bool = False
    # tensors of optimizer state per parameter (AdamW's two moments: 2), for the memory estimate (design §6.2)
    optimizer_states: int = 0
    # after every optimizer step the realised update loses its component along the orbit, so training never
    # moves along it (docs/design.md §13; attnid.model.step_projection)
    projects_steps: bool = False
    # trains the identified parametrisation: per key/value group one D x D block of W_K and of W_V fixed
    # (docs/design.md §14; attnid.model.gauge)
    gauge_fixed: bool = False
    color: str = "gray"
    linestyle: str = "-"
    marker: str = "o"

    def style(self) -> dict:
        """matplotlib keyword arguments plus ``label``."""
        return {"color": self.color, "label": self.label, "linestyle": self.linestyle, "marker": self.marker}


# --------------------------------------------------------------------------------------
# optimizer factories: weight decay (where used) acts on >= 2-D tensors only, as nanoGPT's groups
# --------------------------------------------------------------------------------------


def _peak_lr(cfg: OptimizerSettings) -> float:
    if cfg.lr is None:  # resolve_config sets each case's default
        raise ValueError("an optimizer needs a TrainConfig from resolve_config (lr is unset)")
    return cfg.lr


def sgd(model: GPT, cfg: OptimizerSettings, device_type: str) -> torch.optim.Optimizer:
    # lazy: torch when called: the registry is read by --help and the reports without it
    import torch

    return torch.optim.SGD(model.optimizer_groups(0.0), lr=_peak_lr(cfg), momentum=0.0)


def sgd_weight_decay(model: GPT, cfg: OptimizerSettings, device_type: str) -> torch.optim.Optimizer:
    # lazy: torch when called: the registry is read by --help and the reports without it
    import torch

    # torch's SGD weight_decay adds wd * theta to the gradient: coupled L2, I_t ~ prod(1 - lr wd)^2 I_0
    return torch.optim.SGD(model.optimizer_groups(cfg.weight_decay), lr=_peak_lr(cfg), momentum=0.0)


def sgd_momentum(model: GPT, cfg: OptimizerSettings, device_type: str) -> torch.optim.Optimizer:
    # lazy: torch when called: the registry is read by --help and the reports without it
    import torch

    return torch.optim.SGD(model.optimizer_groups(0.0), lr=_peak_lr(cfg), momentum=cfg.momentum)


def adamw(model: GPT, cfg: OptimizerSettings, device_type: str) -> torch.optim.Optimizer:
    # lazy: torch when called: the registry is read by --help and the reports without it
    import torch

    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(
        model.optimizer_groups(cfg.weight_decay), lr=_peak_lr(cfg), betas=(cfg.beta1, cfg.beta2), **extra
    )


# --------------------------------------------------------------------------------------
# the registry
# --------------------------------------------------------------------------------------

# Colours: the Okabe-Ito palette (colour-blind safe), one hue family per case; line styles
# and markers tell the cases apart in greyscale too. Default learning rates: nanoGPT
# shakespeare-char's for AdamW; SGD needs a larger one.
CASES: dict[str, Case] = {}


def register(case: Case) -> Case:
    """Add ``case`` to the registry (after the existing ones); its name must be new."""
    if case.name in CASES:
        raise ValueError(f"case {case.name!r} is already registered")
    CASES[case.name] = case
    return case


def unregister(name: str) -> None:
    CASES.pop(name)


def get_case(name: str) -> Case:
    """The case called ``name``; an unknown name is a UserError listing the known ones."""
    try:
        return CASES[name]
    except KeyError:
        raise UserError(f"unknown case {name!r}: choose one of {', '.join(CASES)}") from None


def case_names() -> list[str]:
    return list(CASES)


def rebalancing_cases() -> list[str]:
    return [case.name for case in CASES.values() if case.rebalances]


register(
    Case(
        "sgd",
        "SGD",
        "plain SGD, no momentum, no weight decay: the imbalance is conserved (E1)",
        0.1,
        sgd,
        color="#0072B2",
        linestyle="-",
        marker="o",
    )
)
register(
    Case(
        "sgd_wd",
        "SGD + weight decay",
        "SGD with coupled L2 weight decay (--weight-decay) on matrices and embeddings (E2)",
        0.1,
        sgd_weight_decay,
        coupled_weight_decay=True,
        color="#D55E00",
        linestyle="--",
        marker="s",
    )
)
register(
    Case(
        "sgd_momentum",
        "SGD + momentum",
        "SGD with heavy-ball momentum (--momentum, 0.9), no weight decay",
        0.01,
        sgd_momentum,
        optimizer_states=1,
        color="#CC79A7",
        linestyle="-.",
        marker="^",
    )
)
register(
    Case(
        "adamw",
        "AdamW",
        "nanoGPT's AdamW: betas (0.9, 0.99), decoupled weight decay on matrices and embeddings (E2)",
        1e-3,
        adamw,
        optimizer_states=2,
        color="#009E73",
        linestyle="-",
        marker="D",
    )
)
register(
    Case(
        "adamw_rebalance",
        "AdamW + rebalancing",
        "adamw, plus every --rebalance-every steps each attention pair moved along its orbit (E3)",
        1e-3,
        adamw,
        rebalances=True,
        optimizer_states=2,
        color="#000000",
        linestyle="--",
        marker="v",
    )
)
# The interventions on the orbit (docs/design.md §13, §14): adamw's optimizer, model and settings
register(
    Case(
        "adamw_projected",
        "AdamW, projected",
        "adamw with each realised update's component along the orbit removed after the step: no orbit "
        "motion, the imbalance conserved to first order",
        1e-3,
        adamw,
        projects_steps=True,
        optimizer_states=2,
        color="#E69F00",
        linestyle=":",
        marker="P",
    )
)
register(
    Case(
        "adamw_gauge_fixed",
        "AdamW, gauge fixed",
        "adamw on the identified parametrisation: per key/value group one D x D block of W_K and "
        "one of W_V fixed (c I), the rest trained",
        1e-3,
        adamw,
        gauge_fixed=True,
        optimizer_states=2,
        color="#56B4E9",
        linestyle="-.",
        marker="X",
    )
)
# The gauge arm's optimizer control (docs/design.md §14): the identified parametrisation under plain SGD,
# paired with sgd (attnid.plan.interventions.arm_baseline)
register(
    Case(
        "sgd_gauge_fixed",
        "SGD, gauge fixed",
        "sgd on the identified parametrisation: per key/value group one D x D block of W_K and one of "
        "W_V fixed (c I), the rest trained",
        0.1,
        sgd,
        gauge_fixed=True,
        color="#F0E442",
        linestyle="--",
        marker="*",
    )
)
