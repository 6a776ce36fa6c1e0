"""Planning: from graph + costs + budgets to a validated schedule (plan)."""
