module lifeline.test/gosym

go 1.19
