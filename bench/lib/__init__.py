"""What the scenarios share (harness, load generator, servers, clients, model makers, peers' builders, plots) and
each scenario's own report and check helpers; never a scenario."""
