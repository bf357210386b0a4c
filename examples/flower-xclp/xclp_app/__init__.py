"""The example Flower app: XCLP's ServerApp and ClientApp, from the xclp project (xclp_flower/)."""
