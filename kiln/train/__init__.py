"""Training: a step (loss, gradients, optimizer update) compiled into one executable that
updates its weights in place; optimizers, gradient clipping and learning-rate schedules as
kiln functions and inputs; losses for imported models. docs/training.md describes it.

    step = kiln.train.Step(kiln.train.with_loss(mod, "cross_entropy"), params,
                           optimizer=kiln.train.AdamW(lr=1e-3), clip_grad_norm=1.0)
    loss = step(x, labels)
"""

from kiln.train import schedules
from kiln.train.checkpoint import load_checkpoint, save_checkpoint
from kiln.train.losses import cross_entropy, mse, with_loss
from kiln.train.optimizers import SGD, Adam, AdamW, Optimizer
from kiln.train.step import Step

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "Step", "cross_entropy", "load_checkpoint", "mse",
           "save_checkpoint", "schedules", "with_loss"]
