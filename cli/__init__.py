"""The `specfleet` command line: the roof over every room (agent, coordinator, dashboard): its
commands, the demo, the sweep report, the result importers and the tiny-model builder."""
