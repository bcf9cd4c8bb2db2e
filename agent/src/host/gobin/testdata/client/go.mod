module lifeline.test/client

go 1.19
