"""Agent tests: scenario files, the runner behind `hotline test`, the report and JUnit
output (README, "Testing an agent")."""
