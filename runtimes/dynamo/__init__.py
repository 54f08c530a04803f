"""NVIDIA Dynamo: the image as a worker behind Dynamo's frontend and router (an optional extra: ai-dynamo)."""
