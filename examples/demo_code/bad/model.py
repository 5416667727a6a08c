"""The demo job's training code, release "bad": a code change that crashes the job."""


def step(n):
    """One training step; this release breaks the shapes of the new attention block."""
    heads, dim = 12, 1000
    if dim % heads:
        raise ValueError(f"hidden size {dim} is not divisible by {heads} attention heads")
    return 1.0
