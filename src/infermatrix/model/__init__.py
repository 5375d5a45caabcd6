"""Pure knowledge: the cell and its resolved spec, rules, coverage, the compile planner, index metadata. No Docker."""
