package jetstream

// setUp makes the stream and the buckets, or checks existing ones: an
// existing stream or bucket whose settings sluice cannot work with is
// refused with the setting named, never changed behind the operator's back.
func (s *Store) setUp() error {
	if err := s.setUpStream(); err != nil {
		return err
	}
	if err := s.setUpBuckets(); err != nil {
		return err
	}
	return s.setUpFleet()
}
