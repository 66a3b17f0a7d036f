-- Where each instance's relay listener is reached by the others' redirects (issue 21):
-- a relay that dialled a replica not running its session is sent to the address its
-- session's lease owner advertised here (`[relay] advertise`, or the bound address),
-- and never to an address not in this table. NULL: the instance takes no redirects.
ALTER TABLE instances ADD COLUMN relay_addr TEXT;
