// The SQL driver of package fence's Example, laid into that package's test binary by
// exampletest through an overlay: the library's own module requires no driver.

package fence_test

import _ "modernc.org/sqlite"
