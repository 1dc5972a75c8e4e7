"""Reading results: the session folder, Pareto fronts, the report and its figures."""
