"""Usage per tenant: each request's tokens counted by API key, owner and deployment per hour."""
