"""Pipeline-parallel training that knows its bubbles: model, schedules, stages, bubble events."""
