package config

import (
	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/proxy/delivery"
)

// CloudEventsConfig is the sidecar-wide part of CloudEvents: what a
// delivery in a CloudEvents format (a subscription's format) says of an
// event that was not posted as a CloudEvent. Read at start only.
type CloudEventsConfig struct {
	// Source is the source attribute of such events: a URI-reference
	// (cloudevents.CheckSource). Default cloudevents.DefaultSource,
	// "/sluice": the same on every sidecar and restart, so a receiver
	// that deduplicates on source and id sees a redelivered event as the
	// same event. Set one per service when several services' events meet
	// at one receiver, since their ids are unique only per log.
	Source string `koanf:"source"`
}

func (c CloudEventsConfig) validate() error {
	if err := cloudevents.CheckSource(c.Source); err != nil {
		return fieldErr("cloudevents.source", c.Source, invalidf("%v", err))
	}
	return nil
}

// cloudEvents reports whether s delivers in a CloudEvents format.
func (s *SubscriptionConfig) cloudEvents() bool {
	return s.Format == delivery.FormatCloudEventsBinary || s.Format == delivery.FormatCloudEventsStructured
}
