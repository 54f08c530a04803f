"""Pure: target x profiles x model facts -> BuildPlan. No hub client, no torch or onnx."""
