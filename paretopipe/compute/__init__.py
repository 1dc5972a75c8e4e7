"""A stage's compute as an emulated device has it: its CPU share through a cgroup quota
(``cpushare``) and that share over time, a compute trace (``cputrace``). Base services: this
package imports no other subpackage."""
