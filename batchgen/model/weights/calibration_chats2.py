"""The second half of ``calibration_chats.MORE_CHATS``, which extends ``calibration_text.CHATS``."""

from __future__ import annotations

LATER_CHATS: tuple[tuple[str, str], ...] = (
    (
        "How do I undo my last git commit but keep the changes?",
        "Run:\n```bash\ngit reset --soft HEAD~1\n```\nThis moves your branch back by one commit and leaves "
        "the changes from that commit staged, so you can edit them and commit again. If you want the "
        "changes kept but unstaged, use `git reset HEAD~1` (the default `--mixed` mode). Avoid `--hard`, "
        "which throws the changes away. If you already pushed the commit to a shared branch, use `git "
        "revert HEAD` instead, which adds a new commit that undoes it without rewriting history others may "
        "have pulled.",
    ),
    (
        "When do I use 'affect' and when 'effect'?",
        "In most sentences, 'affect' is a verb meaning to influence, and 'effect' is a noun meaning a "
        "result.\n\n- The rain affected the match. (verb)\n- The rain had a big effect on the match. "
        "(noun)\n\nA handy memory trick: **A**ffect is an **A**ction, **E**ffect is an **E**nd result.\n\n"
        "There are exceptions. 'Effect' can be a verb meaning to bring about, as in 'to effect change', "
        "and 'affect' is a noun in psychology, meaning a visible emotion, as in 'a flat affect'.",
    ),
    (
        "What is Impressionism in painting?",
        "Impressionism was an art movement that began in France in the 1860s and 1870s. Painters such as "
        "Claude Monet, Pierre-Auguste Renoir, Camille Pissarro and Berthe Morisot wanted to capture the "
        "fleeting effects of light and colour rather than precise detail. They often painted outdoors, "
        "used quick visible brushstrokes and bright unmixed colours, and chose everyday subjects: cafés, "
        "gardens, boating parties, city streets. Critics first mocked them, and the name comes from "
        "Monet's painting 'Impression, Sunrise' (1872). The style shaped much of the modern art that "
        "followed.",
    ),
    (
        "What does a time signature like 3/4 mean in music?",
        "A time signature sits at the start of a piece and tells you how the beats are grouped. The top "
        "number is how many beats are in each bar, and the bottom number is which note value counts as one "
        "beat: 4 means a quarter note (crotchet), 8 an eighth note (quaver).\n\nSo 3/4 means three "
        "quarter-note beats per bar, counted 'ONE two three', the feel of a waltz. 4/4 is the most common, "
        "used in most pop and rock songs, and 6/8 groups six eighth notes into two swaying beats of three.",
    ),
    (
        "Explain the offside rule in football simply.",
        "A player is in an offside position if, at the moment a teammate plays the ball to them, they are "
        "in the opponents' half and closer to the opponents' goal line than both the ball and the "
        "second-last defender (the goalkeeper usually counts as one of the last two). Being in that "
        "position is not an offence by itself; it is penalised only if the player then becomes involved in "
        "play. You cannot be offside from a throw-in, goal kick or corner kick, and being level with the "
        "second-last defender counts as onside.",
    ),
    (
        "How should a complete beginner start running?",
        "Start with walk-run intervals rather than trying to run non-stop. For example, three times a "
        "week:\n\n- Week 1: 5 minutes of brisk walking, then 8 rounds of 1 minute running and 90 seconds "
        "walking.\n- Week 2: 6 rounds of 2 minutes running and 2 minutes walking.\n- Weeks 3 to 8: slowly "
        "lengthen the running parts until you can run for 20 to 30 minutes.\n\nRun at a pace where you can "
        "still talk. Rest a day between runs, wear comfortable shoes, and if something hurts rather than "
        "just feels tiring, take a few extra days off.",
    ),
    (
        "How do migrating birds find their way?",
        "Birds combine several compasses. Many use the position of the sun during the day, correcting for "
        "its movement with an internal sense of time, and night migrants learn the star patterns around "
        "the celestial pole. They can also sense the Earth's magnetic field, possibly through "
        "light-sensitive proteins in their eyes. Near the end of the journey, landmarks such as "
        "coastlines, rivers and mountain ranges help, and some species use smell. Young birds of many "
        "species make their first trip with no adults to follow, so much of this ability is inherited.",
    ),
    (
        "Why do mushrooms pop up after it rains?",
        "A mushroom is only the fruiting body of a fungus; most of the organism is a network of fine "
        "threads called mycelium that lives in soil or wood all year. When rain soaks the ground, the "
        "mycelium has the water it needs to push up a mushroom, which is made mostly of water and grows "
        "mainly by inflating cells that have already formed rather than by making new ones. That is why "
        "mushrooms can appear overnight. They then release spores into the damp air to start new colonies "
        "elsewhere.",
    ),
    (
        "How does GPS work out where I am?",
        "A network of about thirty satellites orbits the Earth, each broadcasting its position and the "
        "exact time from an onboard atomic clock. Your phone's receiver picks up signals from several of "
        "them and measures how long each took to arrive; since the signals travel at a known speed, each "
        "delay gives a distance. With distances to at least four satellites, the receiver can solve for "
        "its latitude, longitude, altitude and the error of its own cheaper clock. Phones also use Wi-Fi "
        "and mobile network data to get a fix faster.",
    ),
    (
        "My recipe says 350 °F. What is that in Celsius?",
        "Use the formula °C = (°F - 32) x 5/9.\n\n1. 350 - 32 = 318.\n2. 318 x 5 = 1 590.\n3. 1 590 / 9 = "
        "176.7.\n\nSo 350 °F is about 177 °C, and most recipes round it to 180 °C. If you have a fan "
        "(convection) oven, reduce it by about 20 degrees, to 160 °C, because the moving air cooks food "
        "faster. On older British gas ovens the equivalent is gas mark 4.",
    ),
    (
        "How much does it cost to run a 60 W lamp five hours a day for a month at 0.30 per kWh?",
        "Step by step, for a 30-day month:\n\n1. Daily energy: 60 W x 5 h = 300 Wh = 0.3 kWh.\n2. Monthly "
        "energy: 0.3 kWh x 30 = 9 kWh.\n3. Cost: 9 kWh x 0.30 = 2.70.\n\nSo the lamp costs about 2.70 a "
        "month. An LED bulb giving the same light uses around 8 to 9 W, which would cut the cost to "
        "roughly 0.40 a month, and it lasts many times longer than an old incandescent bulb.",
    ),
    (
        "What is the probability of rolling a total of 7 with two dice?",
        "Two six-sided dice have 6 x 6 = 36 equally likely outcomes. The pairs that add up to 7 are (1,6), "
        "(2,5), (3,4), (4,3), (5,2) and (6,1), which is 6 outcomes. The probability is 6 / 36 = 1/6, about "
        "16.7 %.\n\nSeven is the most likely total, because every value of the first die can be matched by "
        "exactly one value of the second. Totals of 2 and 12, by contrast, can each happen in only one "
        "way, a probability of 1/36.",
    ),
    (
        "Find the mean, median and mode of 4, 8, 6, 5, 3, 8, 9.",
        "First sort the numbers: 3, 4, 5, 6, 8, 8, 9.\n\n- **Mean:** the sum is 3 + 4 + 5 + 6 + 8 + 8 + 9 "
        "= 43, and there are 7 values, so the mean is 43 / 7 ≈ 6.14.\n- **Median:** with 7 values the "
        "middle one is the 4th, which is 6.\n- **Mode:** 8 appears twice and every other number once, so "
        "the mode is 8.\n\nThe mean is a little above the median because the larger values pull it up.",
    ),
    (
        "How can I compute the average of a column in a CSV file with Python?",
        "With only the standard library:\n```python\nimport csv\n\n\ndef column_average(path, column):\n   "
        ' with open(path, newline="") as f:\n        values = [float(row[column]) for row in '
        "csv.DictReader(f) if row[column]]\n    return sum(values) / len(values) if values else None\n\n\n"
        'print(column_average("sales.csv", "amount"))\n```\n`DictReader` uses the header row, so you '
        "refer to the column by name, and empty cells are skipped. With pandas installed it is one line: "
        '`pd.read_csv("sales.csv")["amount"].mean()`.',
    ),
    (
        "Write a TypeScript function that groups a list of users by their country.",
        "```typescript\ninterface User {\n  name: string;\n  country: string;\n}\n\nfunction "
        "groupByCountry(users: User[]): Record<string, User[]> {\n  const groups: Record<string, User[]> = "
        "{};\n  for (const user of users) {\n    (groups[user.country] ??= []).push(user);\n  }\n  return "
        "groups;\n}\n```\nThe `??=` operator creates an empty array the first time a country appears. "
        "Calling it with Ana from Spain, Ben from Canada and Luis from Spain returns `{ Spain: [Ana, "
        "Luis], Canada: [Ben] }`.",
    ),
    (
        "Write a Dockerfile for a small Flask app.",
        "```dockerfile\nFROM python:3.12-slim\n\nWORKDIR /app\nCOPY requirements.txt .\nRUN pip install "
        '--no-cache-dir -r requirements.txt\n\nCOPY . .\nEXPOSE 8000\nCMD ["gunicorn", "--bind", '
        '"0.0.0.0:8000", "app:app"]\n```\nCopying `requirements.txt` before the rest of the code lets '
        "Docker cache the installed packages, so rebuilding after a code change is fast. Add `gunicorn` to "
        "the requirements, since Flask's own server is meant only for development. Build with `docker "
        "build -t myapp .` and run with `docker run -p 8000:8000 myapp`.",
    ),
    (
        "Write a very short story about a key found inside a library book.",
        "Ines found the key pressed between pages 112 and 113 of a battered atlas: small, brass, with a "
        "tag that read 'Locker 9'. The library had no lockers. The swimming pool across the road did. She "
        "turned the key over for a week before curiosity won. Locker 9 creaked open on a single envelope "
        "addressed to 'Whoever reads atlases'. Inside was a hand-drawn map of the town, with a red cross "
        "on the old bookshop. She went there at once. The bookseller smiled, as if he had been waiting for "
        "years, and handed her a second key.",
    ),
    (
        "Write a dialogue between two friends planning a weekend hike.",
        "Maya: Are you still up for a hike on Saturday?\nTom: Definitely. Which trail were you thinking "
        "of?\nMaya: The ridge loop above the reservoir. It's about 14 kilometres.\nTom: That's doable if "
        "we start early. Eight in the morning?\nMaya: Perfect. The forecast says showers after three, so "
        "we should be down by then.\nTom: I'll bring sandwiches and the first-aid kit.\nMaya: Great, I'll "
        "bring water, snacks and a printed map in case there's no signal.\nTom: Deal. I'll pick you up at "
        "half seven.",
    ),
    (
        "Write a short free-verse poem about a kitchen on a Sunday morning.",
        "Sunlight finds the kitchen first,\nlaying a bright stripe across the table\nwhere last night's "
        "crossword\nstill waits with three empty squares.\nThe radio murmurs about rain somewhere else.\n"
        "Eggs tick in the pan,\nsomeone hums the wrong words to an old song,\nand the window fogs\nwith "
        "steam from the pot of oats.\nNobody is in a hurry.\nThe whole day waits\nlike a folded napkin\n"
        "that no one has opened yet.",
    ),
    (
        "Write a product description for a stainless steel reusable water bottle.",
        "Meet the bottle that keeps up with your day. Made from double-walled 18/8 stainless steel, it "
        "keeps drinks cold for 24 hours and hot for 12, without sweating in your bag. The leak-proof lid "
        "has a loop for carrying and opens with one hand, while the wide mouth fits ice cubes and is easy "
        "to clean. At 750 ml, it holds enough for a long meeting, a gym session or a day of sightseeing. "
        "It is free of BPA, tastes of nothing but what you put in it, and replaces hundreds of single-use "
        "plastic bottles a year.",
    ),
    (
        "How do I apologise to a friend for forgetting their birthday?",
        "Apologise soon and simply, without long excuses. For example: 'I'm really sorry I missed your "
        "birthday. There's no good reason, I just lost track of the date, and I feel bad because you "
        "matter to me.' Then show it rather than only saying it: suggest a plan, such as dinner or a film "
        "this week, and make it about them. Put their birthday in your calendar with a reminder a few days "
        "early so it doesn't happen again. Most friends forgive a forgotten date quickly if the apology is "
        "sincere.",
    ),
    (
        "How do I grow basil indoors?",
        "- **Light:** basil needs at least six hours of sun, so use your sunniest window or a small grow "
        "light for 12 to 14 hours a day.\n- **Pot:** choose one with drainage holes and fill it with "
        "ordinary potting compost.\n- **Water:** water when the top centimetre of soil feels dry, and "
        "never let the pot stand in water.\n- **Warmth:** keep it above about 15 °C and away from cold "
        "draughts.\n- **Harvest:** regularly pinch off the top pair of leaves just above a node, which "
        "makes the plant bushier, and remove flower buds as they appear.",
    ),
    (
        "What does pH measure?",
        "pH measures how acidic or basic a water-based solution is, based on the concentration of hydrogen "
        "ions. The scale usually runs from 0 to 14: 7 is neutral, lower values are acidic and higher "
        "values are basic (alkaline). It is logarithmic, so each step is a tenfold change: a solution at "
        "pH 3 has ten times more hydrogen ions than one at pH 4. Some examples: stomach acid is about 1.5 "
        "to 3.5, tomato juice about 4, blood about 7.4 and household bleach around 12 to 13.",
    ),
    (
        "What is the difference between mass and weight?",
        "Mass is the amount of matter in an object, measured in kilograms, and it stays the same wherever "
        "the object is. Weight is the force of gravity acting on that mass, measured in newtons, and it "
        "depends on where you are. Weight equals mass times gravitational acceleration: a 70 kg person "
        "weighs about 70 x 9.81 ≈ 687 N on Earth. A bathroom scale really measures a force but shows it in "
        "kilograms, assuming the Earth's gravity; astronauts in orbit keep all their mass while feeling "
        "weightless.",
    ),
    (
        "What is DNA, in a few sentences?",
        "DNA, short for deoxyribonucleic acid, is the molecule that carries the genetic instructions of "
        "almost every living thing. It is shaped like a twisted ladder, the double helix, whose rungs are "
        "pairs of four chemical bases: adenine pairs with thymine, and cytosine with guanine. The order of "
        "these bases spells out genes, which cells read to build proteins. Before a cell divides, the two "
        "strands separate and each serves as a template for a new partner, so both daughter cells receive "
        "a copy. Human DNA has about three billion base pairs.",
    ),
    (
        "What is Occam's razor?",
        "Occam's razor is the principle that, when several explanations fit the evidence equally well, you "
        "should prefer the one that needs the fewest assumptions. It is named after William of Ockham, a "
        "14th-century English friar and philosopher. It is not a law that the simplest answer is always "
        "true, but a rule of thumb for deciding which idea to test first. For example, if your car won't "
        "start on a cold morning, a flat battery is a better first guess than sabotage, because it "
        "requires nothing unusual to have happened.",
    ),
    (
        "Give me a brief summary of Pride and Prejudice.",
        "Jane Austen's novel, published in 1813, follows Elizabeth Bennet, the lively second of five "
        "daughters in a family whose estate will pass to a male cousin. At a local ball she meets the "
        "wealthy Mr Darcy, whose pride offends her, and she readily believes the charming Mr Wickham's "
        "stories against him. She refuses Darcy's first, awkward proposal. His letter explaining himself, "
        "and later his quiet help when her sister Lydia elopes with Wickham, change her view. Both "
        "overcome their pride and prejudice, and they marry.",
    ),
    (
        "Write a short thank-you note to my daughter's teacher at the end of the year.",
        "Dear Ms Alvarez,\n\nAs the school year comes to an end, we wanted to thank you for everything you "
        "have done for Lily. She started the year nervous about reading aloud and now reads bedtime "
        "stories to her little brother. She talks about your class every evening, especially the science "
        "experiments and the class garden.\n\nThank you for your patience, your encouragement and the care "
        "you put into every day. We hope you have a restful summer.\n\nWith warm wishes,\nDaniel and Sofia "
        "Reyes",
    ),
    (
        "Label each review as positive, negative or mixed: 1) 'Arrived fast and works perfectly.' 2) 'Nice "
        "design, but the battery dies in an hour.' 3) 'Broke on the second day, and support never "
        "answered.'",
        "1) **Positive.** The reviewer praises both the delivery speed and the product, with no "
        "complaints.\n2) **Mixed.** The design is praised, but the short battery life is a serious "
        "complaint, and 'but' signals the turn.\n3) **Negative.** The product failed almost at once and "
        "customer support did not respond, so both the item and the service disappointed.\n\nIn total: one "
        "positive, one mixed and one negative review. The recurring concern worth passing to the product "
        "team is reliability, including battery life.",
    ),
    (
        "Write an email requesting a refund for a concert that was cancelled.",
        "Subject: Refund request for cancelled concert, order 48213\n\nDear Customer Services,\n\nI bought "
        "two tickets for The Velvet Hours concert at the Riverside Arena on 12 October (order number "
        "48213, total 96 pounds). I have since learned that the event was cancelled and has not been "
        "rescheduled.\n\nPlease refund the full amount, including booking fees, to the card I used for the "
        "purchase. I would be grateful if you could confirm once the refund has been processed.\n\nKind "
        "regards,\nPriya Shah",
    ),
    (
        "What does the saying 'a stitch in time saves nine' mean?",
        "It means that fixing a small problem as soon as you notice it saves much more work later. The "
        "image comes from sewing: one stitch to mend a small tear in a piece of clothing now stops the "
        "tear from growing until it needs nine stitches or more to repair. The number nine is not meant "
        "exactly; it was probably chosen because it sounds good after 'time'. You might use it when "
        "someone puts off a small repair on the car or ignores a minor bug in their code.",
    ),
    (
        "If it is 3 p.m. in London in January, what time is it in Tokyo and New York?",
        "In January London uses Greenwich Mean Time (UTC+0), since British Summer Time is not in effect.\n"
        "\n- **Tokyo** is on Japan Standard Time, UTC+9, with no daylight saving time. 3 p.m. + 9 hours = "
        "midnight, the start of the next day.\n- **New York** uses Eastern Standard Time in winter, UTC-5. "
        "3 p.m. - 5 hours = 10 a.m. the same day.\n\nIn summer London moves to UTC+1 and New York to "
        "UTC-4, so New York stays five hours behind London, but Tokyo is then only eight hours ahead.",
    ),
)
