"""`thicket eval`: a policy's pass@1, pass@k and mean return on a task set, with 95% intervals,
from independent samples grown through the product's own path."""
