-- When a tenant became postpaid, and when it last stopped being postpaid, so
-- that the monthly invoicer issues an invoice for every month in which the
-- tenant was postpaid at some time (a tenant switched back to prepaid still
-- gets the invoice of its last postpaid month), and none for months before
-- it became postpaid. NULL postpaid_since on a postpaid tenant (set before
-- this migration): postpaid since it was created.
ALTER TABLE tenants ADD COLUMN postpaid_since timestamptz;
ALTER TABLE tenants ADD COLUMN postpaid_until timestamptz;
