"""The search loop's five steps (generate, forecast, select, measure, update) as Prefect tasks, and the search state."""
