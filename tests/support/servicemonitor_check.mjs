// Validates a ServiceMonitor (JSON file, argv[2]) with @kubernetes-models/prometheus-operator: validators
// compiled from the Prometheus operator's CRD schema. Prints "valid", or the errors and exits 1.
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

try {
  new ServiceMonitor(JSON.parse(readFileSync(process.argv[2], "utf8"))).validate();
  console.log("valid");
} catch (error) {
  console.log(`invalid: ${error.message}`);
  process.exit(1);
}
