// Package helm holds the tests of the jetbridge Helm chart (./jetbridge):
// they render the chart through the Helm SDK with default and non-default
// values, lint it, decode every rendered object strictly into its Go type
// and check the properties the deployment relies on. See docs/deploy.md,
// "Kubernetes with the Helm chart".
package helm
